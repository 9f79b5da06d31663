// "AcrPull" on an existing Azure Container Registry for the identities that
// pull sbclaim's images, deployed in the registry's resource group.

@description('Name of the existing container registry.')
param registryName string

@description('Principal (object) ids that may pull images.')
param principalIds array

var acrPull = '7f951dda-4ed3-4680-a7ca-43fe172d538d'

resource registry 'Microsoft.ContainerRegistry/registries@2023-07-01' existing = {
  name: registryName
}

resource pull 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for principalId in principalIds: {
  scope: registry
  name: guid(registry.id, principalId, acrPull)
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', acrPull)
  }
}]

@description('Login server, e.g. contoso.azurecr.io.')
output loginServer string = registry.properties.loginServer
